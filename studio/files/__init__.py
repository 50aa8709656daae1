"""Files on disk: atomic writes and the one bounded ZIP reader."""
