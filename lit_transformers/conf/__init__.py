"""The Hydra configs. Importing the package (Hydra does, to read ``pkg://lit_transformers.conf``) registers the
resolvers they use, whichever entry point or test composes them."""

from lit_transformers.utils.cluster import register_resolvers

register_resolvers()
