"""Audio out of a take: formats, loudness, mastering checks, transcription and captions."""
