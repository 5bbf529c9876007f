"""Model families torchtune 0.6.1 lacks, built by this project on 0.6.1's own modules: one module per family.

Each module's builders are named by `_component_` in resolved configs (model_inspection.FAMILIES). Importing a
family module needs torch; this package itself imports nothing, so its builders' signatures can be read from
source (installed) where torch is absent.
"""
