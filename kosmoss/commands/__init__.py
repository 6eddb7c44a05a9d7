"""One module per ``kosmoss`` subcommand: its parser, its command function, its main()."""
