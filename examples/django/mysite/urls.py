from django.urls import path
from notes import views

urlpatterns = [
    path("notes", views.add_note, name="add-note"),
    path("results/<str:result_id>", views.result, name="result"),
]
