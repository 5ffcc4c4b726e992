// Package when reads the times and ages that people type into the outbox command: a time
// (RFC 3339, or a date as UTC midnight) or an age before now (72h, 90m, 7d, 1d12h).
package when

import (
	"fmt"
	"regexp"
	"strconv"
	"time"
)

// days matches a leading whole number of days, as in 7d or 1d12h.
var days = regexp.MustCompile(`^(\d+)d`)

// Duration reads a Go duration (72h, 90m) that may begin with whole days (7d, 1d12h).
func Duration(s string) (time.Duration, error) {
	var d time.Duration
	rest := s
	if m := days.FindStringSubmatch(s); m != nil {
		n, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil || n > int64(time.Duration(1<<63-1)/(24*time.Hour)) {
			return 0, fmt.Errorf("%q is too long", s)
		}
		d = time.Duration(n) * 24 * time.Hour
		rest = s[len(m[0]):]
	}
	if rest != "" {
		r, err := time.ParseDuration(rest)
		if err != nil || (d > 0 && r < 0) {
			return 0, fmt.Errorf("%q is not a duration (use 72h, 90m or 7d)", s)
		}
		if d > 0 && r > time.Duration(1<<63-1)-d {
			return 0, fmt.Errorf("%q is too long", s)
		}
		d += r
	}
	return d, nil
}

// Parse reads a time (RFC 3339, or a date as UTC midnight) or a positive age before now (a
// duration as Duration reads it), in UTC. "" is the zero time.
func Parse(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	d, err := Duration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("%q is neither a time (2026-01-02T15:04:05Z, 2026-01-02) nor an age (90m, 72h, 7d)", s)
	}
	return now.Add(-d).UTC(), nil
}
