"""Pure math: floats and numpy arrays in and out (numpy/scipy only; no torch, no lightning)."""
