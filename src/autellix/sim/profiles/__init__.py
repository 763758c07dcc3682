"""Engine profiles for the simulator: capacity and step cost, one JSON file each (``EngineProfile.load``)."""
