"""Analysis: pure numpy/scipy algorithms on columnar arrays (skeleton inference, detection,
localization). Modules here import neither the probing engine nor skh.orchestrator."""
