"""``opgen build``: the generated package of every op (``freeze``), its dispatch tables as written
(``table_layout``)."""
