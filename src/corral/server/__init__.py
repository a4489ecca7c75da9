"""The server put together: `app` builds the control plane and the application that
serves the API, the workspaces and the dashboard; `main` runs it (`corral server`,
`corral up`); `demo` and `typegen` use it."""
