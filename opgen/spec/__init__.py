"""The spec: ``specs/<op>.yaml`` loaded into frozen, validated models (``spec``, ``spec_model``,
``spec_semantics``, ``spec_values``, ``schema``), the safe formulas it holds (``expr``), the chips it
budgets for (``hardware``) and its dispatch keys (``keys``)."""
