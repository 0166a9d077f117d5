from ditty.cli import main

raise SystemExit(main())
