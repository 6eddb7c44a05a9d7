"""What every layer shares, none of it torch: one-line errors and their exit codes
(:mod:`.errors`, :mod:`.commandline`), files written whole (:mod:`.files`), where data and
runs live (:mod:`.paths`), and the course's model and rate (:mod:`.defaults`)."""
