"""Long-form transcription: Whisper's seek-by-timestamps algorithm over a whole recording, with
segments, quality checks, temperature fallback and subtitle outputs; `api.Transcriber` is the one
file -> text path the command line, the benchmarks and the services use."""
