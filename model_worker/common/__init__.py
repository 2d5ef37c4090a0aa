"""The engine's shared vocabulary, torch-free: user errors, library defaults, the one settings
class, safe export names and text, log redaction. Imports nothing else of the engine."""
