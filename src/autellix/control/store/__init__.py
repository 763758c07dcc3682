"""The gateway's store: what a gateway (or the endpoint picker) keeps of programs, stored responses and engine drains.

One object, ``GatewayStore`` (``base``), in this process or shared by replicas through Redis
(``shared``); the request controller and the session rules reach programs only through the
``ProgramStore`` interface (``programs``). Import from the modules; this package re-exports nothing.

* ``base``: the store as one object: ``GatewayStore``, ``MemoryStore``, ``open_store``, ``redacted_url``;
* ``programs``: the ``ProgramStore`` interface and ``MemoryProgramStore``;
* ``responses``: where each stored Responses API response lives;
* ``drains``: engine drains, here or on every replica;
* ``shared``: ``SharedStore``, the store shared through Redis over one client;
* ``redis_programs``: ``RedisProgramStore``, programs shared through Redis;
* ``connection``: the Redis client, its keys and epoch, what "out of reach" is;
* ``scripts``: a program's hash in Redis and the Lua scripts that change it;
* ``health``: whether the shared store answers, as metrics;
* ``outage``: what a replica owes a store it could not reach, written back after;
* ``takeover``: a program taken over gets back the service its engines counted.
"""
