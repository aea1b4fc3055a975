"""Float64 golden references of opgen's operators, independent of any kernel."""
