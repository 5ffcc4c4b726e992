//go:build linux

package sqlite

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

// fileWatch tells when files change, through Linux's inotify: the SQLite listener watches
// the database file and its write-ahead log, which every commit writes, so that it checks
// for commits when one happened rather than at a short interval. Standard library only.
type fileWatch struct {
	f     *os.File // the inotify descriptor, non-blocking, so reads use Go's poller
	paths []string
	buf   [4096]byte
}

// watchFiles watches paths for writes, removal and renaming; a path that does not exist
// is skipped (the write-ahead log of a database not in WAL mode).
func watchFiles(paths ...string) (*fileWatch, error) {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	w := &fileWatch{f: os.NewFile(uintptr(fd), "inotify")}
	for _, p := range paths {
		_, err := syscall.InotifyAddWatch(fd, p, syscall.IN_MODIFY|syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF)
		switch {
		case err == nil:
			w.paths = append(w.paths, p)
		case errors.Is(err, syscall.ENOENT):
		default:
			_ = w.f.Close()
			return nil, err
		}
	}
	if len(w.paths) == 0 {
		_ = w.f.Close()
		return nil, os.ErrNotExist
	}
	return w, nil
}

// wait returns when a watched file changed (true), after d without a change (false), or
// when ctx ends (its error). Changes that came since the previous wait count.
func (w *fileWatch) wait(ctx context.Context, d time.Duration) (bool, error) {
	if err := w.f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return false, err
	}
	stop := context.AfterFunc(ctx, func() { _ = w.f.SetReadDeadline(time.Now()) })
	defer stop()
	n, err := w.f.Read(w.buf[:])
	switch {
	case ctx.Err() != nil:
		return false, ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, nil
	case err != nil:
		return false, err
	}
	return n > 0, nil
}

func (w *fileWatch) close() { _ = w.f.Close() }
