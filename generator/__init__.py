"""Spec -> render -> write. Renderers are pure; only ``writer`` touches disk.

The spec itself (schema, model, units, errors) is :mod:`fusebox.spec`, one floor below.
"""
