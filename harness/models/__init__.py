"""The models room: a model's dimensions and dtypes (``model_spec``), its layer groups
(``model_layers``) and the readers of a Hugging Face checkpoint's config.json (``hf_config``,
``hf_fields``, ``hf_layers``). Imports only the shared modules (errors, file I/O, the spec
schema)."""
