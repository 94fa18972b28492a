package client

import "github.com/sbx-dev/sbx/coordinator/api"

// The API's types, as package api declares them for the client and the server alike.
type (
	Job                = api.Job
	TTYSize            = api.TTYSize
	Port               = api.Port
	Limits             = api.Limits
	Usage              = api.Usage
	Timings            = api.Timings
	Source             = api.Source
	NotifyOnOutput     = api.NotifyOnOutput
	StartRequest       = api.StartRequest
	StartReply         = api.StartReply
	WaitReply          = api.WaitReply
	JobsQuery          = api.JobsQuery
	Runner             = api.Runner
	Notification       = api.Notification
	Notifications      = api.NotificationsReply
	NotificationsQuery = api.NotificationsQuery
	Session            = api.Session
)

// Job statuses.
const (
	StatusQueued    = api.StatusQueued
	StatusRunning   = api.StatusRunning
	StatusSucceeded = api.StatusSucceeded
	StatusFailed    = api.StatusFailed
	StatusAborted   = api.StatusAborted
)

// Formats of a notification's text.
const (
	// FormatSystem is the agent-tool <system_notification> format (Cursor's), the default.
	FormatSystem = api.FormatSystem
	// FormatTask is Claude Code's <task-notification> format.
	FormatTask = api.FormatTask
)
