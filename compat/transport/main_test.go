package transport_test

import (
	"os"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) {
	// A worker of TestAdaptiveFleet or TestSDKFleet is this test binary started again: it
	// runs its share of the workload and exits before any test is run.
	if os.Getenv(adaptiveWorkerEnv) != "" {
		os.Exit(adaptiveWorker())
	}
	if os.Getenv(sdkWorkerEnv) != "" {
		os.Exit(sdkWorker())
	}
	redistest.Main(m)
}
