from otel_rl._internal.cli import main

raise SystemExit(main())
