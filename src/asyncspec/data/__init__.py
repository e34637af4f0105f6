"""Speech and text sources: the bundled LibriVox clips and windows joined from them, audio folders
as windows, the synthetic development set and long recordings, and the AsymSpec text workloads."""
