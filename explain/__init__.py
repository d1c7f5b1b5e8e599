"""`compactd explain`, a room of its own: the explanation of one partition, per rule (`model`, pure), every
partition's worst figures at once for the ranking (`rank`), and the text people read (`text`); the command is
app/explain_cli.py."""
