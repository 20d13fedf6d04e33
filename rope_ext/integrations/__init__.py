"""Integrations of rope_ext with other libraries.

    from rope_ext.integrations import transformers as rope_hf
    model = rope_hf.patch(model)     # a loaded HF transformers model

Each integration is a submodule, imported on demand, so `import rope_ext` never imports
the library it integrates with.
"""
