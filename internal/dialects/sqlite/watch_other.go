//go:build !linux

package sqlite

import (
	"context"
	"errors"
	"time"
)

// fileWatch is unavailable on this system: the SQLite listener polls instead.
type fileWatch struct{}

func watchFiles(...string) (*fileWatch, error) { return nil, errors.ErrUnsupported }

func (*fileWatch) wait(context.Context, time.Duration) (bool, error) {
	return false, errors.ErrUnsupported
}

func (*fileWatch) close() {}
