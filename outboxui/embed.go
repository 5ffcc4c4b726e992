package outboxui

import "embed"

// assets are the page templates and the static files (stylesheet, script), compiled into
// the binary.
//
//go:embed templates/*.html static/*
var assets embed.FS
