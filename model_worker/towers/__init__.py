"""A method: the two towers of one head, its QK score decomposed (`run`). Uses model/, resources/
and analysis/; never service/."""
