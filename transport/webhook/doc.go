// Package webhook is under construction.
package webhook
