"""In practice (chapters 17-18): a pretrained model read and rebuilt, and
attention in LLM inference (caches, latent attention, sinks, paging, logit control)."""
