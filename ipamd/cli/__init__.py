"""`ipamctl`, the operator's command line."""
