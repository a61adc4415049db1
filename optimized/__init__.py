"""The optimized MoE: Triton FP8 fused MoE running inside two shared workspaces."""
