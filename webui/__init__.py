"""The web admin UI's files, served by doq_lib/http/app.py. A package only so that
`pip install .` installs them next to doq_lib."""
