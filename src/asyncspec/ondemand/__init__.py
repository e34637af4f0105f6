"""On-demand audio service: ingestion, background preparation, requests over HTTP, streaming."""
