// Renders /openapi.json with the vendored Swagger UI ("Try it out" calls this node).
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    docExpansion: "list",
    tryItOutEnabled: false,
    validatorUrl: null,
  });
});
