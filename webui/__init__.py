"""The web admin UI's files, served by doq_lib/http_api.py. A package only so that
`pip install .` installs them next to doq_lib."""
