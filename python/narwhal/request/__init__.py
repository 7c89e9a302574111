"""A completion request as the router reads it: parsing and validation, deadlines, engine bodies."""
