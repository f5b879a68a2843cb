"""Post-training with rewards (GRPO and its variants) over cardjax's own trainer."""
