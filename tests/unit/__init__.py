"""Unit tests: pure and in-process (a local sh at most, @fake or @local pyinfra hosts), no simulated nodes."""
