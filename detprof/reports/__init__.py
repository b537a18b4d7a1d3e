"""Renderers: HTML, Markdown and CI outputs over analysed results."""
