"""Template kernel files, one per op family, each a valid candidate file (docs/CONTRACTS.md section 1).

The offline author renders a candidate by rewriting the strategy constants at the top of a
template (the lines between `# strategy:begin` and `# strategy:end`) and its ADAPTER.
"""
