"""PowerGuard ckpt-agent: Consistent, durable, two-tier PyTorch DCP checkpoints inside every training rank."""
