"""pytest plugin (entry point `diffmoe`): fixtures for testing an MoE implementation."""
