from autellix.cli import app

app(prog_name="autellix")
