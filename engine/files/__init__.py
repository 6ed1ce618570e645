"""The project folder: keepstep.toml, contract.md, sources.toml + sources/, plan.toml, and the
conversion of sources (PDF, Word, Excel, slides, web pages) into text with locators."""
