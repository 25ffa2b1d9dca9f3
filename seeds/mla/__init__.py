"""The multi-head latent attention seed (reference.py, kernel.py): DeepSeek-V3's MLA, latent form."""
