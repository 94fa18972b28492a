//go:build !(cgo && linux)

package sandbox

// warmInit reports that this build can keep pre-joined init steps: without the C constructor the
// init step is Go's, which cannot wait for a job before its runtime starts, so every v1 start joins
// its cgroups then.
const warmInit = false
