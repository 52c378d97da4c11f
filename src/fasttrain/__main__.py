from fasttrain.cli import main

raise SystemExit(main())
