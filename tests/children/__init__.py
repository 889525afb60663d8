"""Child processes the tests start (``python -m tests.children.NAME``); no tests here."""
