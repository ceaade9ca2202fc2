"""The site: cases and stored results rendered into mkdocs-material pages and matplotlib plots.

Data flows one way: `book` loads validated cases and results, `pages` writes Markdown from them,
`plots` draws SVGs, `site` hands both to mkdocs (through `hooks`). Nothing here imports or runs a
kernel module: a kernel's source is read as text.
"""
