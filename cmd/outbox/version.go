package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version returns the module version the binary was built from: a release tag for
// go install ...@vX.Y.Z, "(devel)" for a build inside the repository.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(unknown)"
}

func runVersion(_ context.Context, c *cli, args []string) error {
	fs := c.flagSet("version")
	pos, err := c.parse(fs, "  outbox version [--json]", args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("version takes no arguments, got %q", pos[0])
	}
	if c.global.json {
		c.printJSON(map[string]string{"version": version(), "go": runtime.Version()})
		return nil
	}
	fmt.Fprintf(c.stdout, "outbox %s (%s)\n", version(), runtime.Version())
	return nil
}
