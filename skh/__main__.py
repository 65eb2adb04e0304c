from skh.cli import main

raise SystemExit(main())
