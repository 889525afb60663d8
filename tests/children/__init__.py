"""Child processes the tests start (writers, killers, servers); no tests here."""
