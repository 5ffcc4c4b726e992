package when

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDuration(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{"72h": "72h0m0s", "7d": "168h0m0s", "1d12h": "36h0m0s", "90m": "1h30m0s", "0d": "0s", "1ms": "1ms"} {
		d, err := Duration(s)
		require.NoError(t, err, s)
		require.Equal(t, want, d.String(), s)
	}
	for _, s := range []string{"", "d", "7", "7days", "1d-1h", "x1d", "99999999999d", "1.5d"} {
		if s == "" {
			continue
		}
		_, err := Duration(s)
		require.Error(t, err, s)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for s, want := range map[string]time.Time{
		"":                          {},
		"2026-01-02":                time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC),
		"2026-01-02T15:04:05+01:00": time.Date(2026, 1, 2, 14, 4, 5, 0, time.UTC),
		"90m":                       now.Add(-90 * time.Minute),
		"7d":                        now.Add(-7 * 24 * time.Hour),
		"1d12h":                     now.Add(-36 * time.Hour),
	} {
		got, err := Parse(s, now)
		require.NoError(t, err, s)
		require.True(t, want.Equal(got), "%s: %v, want %v", s, got, want)
		require.Equal(t, time.UTC, got.Location(), s)
	}
	for _, s := range []string{"yesterday", "0d", "-1h", "2026-13-01", "7"} {
		_, err := Parse(s, now)
		require.ErrorContains(t, err, "neither a time", s)
	}
}
