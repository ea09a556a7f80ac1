"""Integrations of sglang-fl with serving engines (SGLang); each imports its engine lazily."""
