"""`doq tui`: the Textual terminal console (tui.app)."""
