"""The command line: ``main`` (the entry point), the parser (``cli_parser``), the project a verb
names (``cli_project``) and the verbs of a campaign, of timing, of reading the committed files
(``cli_campaign``, ``cli_bench``, ``cli_inspect``)."""
